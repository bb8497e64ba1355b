#!/usr/bin/env bash
# graphviz.sh PTC PTC_TOKENIZE SOURCE_DIR - the README's `ptc --emit dot examples/gpt2.ptm |
# dot -Tsvg > gpt2.svg` works on a machine set up by tools/setup.sh (issue 9, item 15: set-up did
# not install graphviz, so the command failed with "dot: command not found"). Fails where dot is
# missing: tools/setup.sh installs it.
source "$(dirname "$0")/lib.sh"
if ! command -v dot > /dev/null; then
  bad "dot is installed" "no 'dot' on PATH: tools/setup.sh installs graphviz"
  finish
  exit
fi
ok "dot is installed" "$(command -v dot)"
check "ptc --emit dot gpt2.ptm | dot -Tsvg" 0 "" bash -c "set -o pipefail; \"\$0\" --emit dot \"\$1\" | dot -Tsvg > gpt2.svg" "$ptc" "$src/examples/gpt2.ptm"
if grep -q "<svg" gpt2.svg && grep -q "</svg>" gpt2.svg && [ "$(grep -c '<g id="node' gpt2.svg)" -gt 100 ]; then
  ok "the SVG has the graph" "$(grep -c '<g id="node' gpt2.svg) nodes, $(stat -c %s gpt2.svg) bytes"
else
  bad "the SVG has the graph" "$(head -c 200 gpt2.svg)"
fi
grep -q "graphviz" "$src/tools/setup.sh" && ok "tools/setup.sh installs graphviz" "" || bad "tools/setup.sh installs graphviz" "not in its package list"
finish
