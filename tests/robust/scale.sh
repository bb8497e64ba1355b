#!/usr/bin/env bash
# scale.sh PTC PTC_TOKENIZE SOURCE_DIR - compile time grows linearly with the model (issue 9,
# item 7). Models with 40,000 of one thing each (consts, params, variables, block declarations,
# block instances, model inputs) must compile in a few seconds; each did in 0.1-0.5 s when this
# was written, and a quadratic front end needed 3-35 s. A --place glob whose stars a backtracking
# matcher tries in every arrangement must cost nothing.
source "$(dirname "$0")/lib.sh"
max=${PTC_SCALE_MAX_S:-5} # seconds one compile may take (20 under AddressSanitizer, 4x slower)
no_asan "$ptc" || max=${PTC_SCALE_MAX_S:-20}

"$python" - << 'EOF2' || { bad "setup" "python could not write the models"; finish; exit; }
n = 40000
head = "model m(x: f32[4, 8]) {\n    param w : [8, 8] init normal(0.02)\n"
loss = "    return mean(mean(%s @ w, axis=-1), axis=-1)\n}\n"
block = "block b%s(a: f32[4, 8]) -> f32[4, 8] {\n    param g : [8] init ones\n    return a * g\n}\n"
models = {
    "consts": "const c0 = 1\n" + "".join(f"const c{i} = c{i-1} + 1\n" for i in range(1, n))
              + head + loss % "x",
    "params": head + "".join(f"    param p{i} : [2] init zeros\n" for i in range(n)) + loss % "x",
    "variables": head + "    y0 = x\n" + "".join(f"    y{i} = y{i-1} + 1\n" for i in range(1, n))
                 + loss % f"y{n-1}",
    "blocks": "".join(block % i for i in range(n)) + head + "    y = x\n"
              + "".join(f"    y = b{i}(y)\n" for i in range(n)) + loss % "y",
    "instances": block % "" + head + "    y = x\n"
                 + "".join(f"    y = b(y) as n{i}\n" for i in range(n)) + loss % "y",
    "inputs": "model m(x: f32[4, 8], " + ", ".join(f"i{k}: f32[2]" for k in range(n)) + ") {\n"
              + "    param w : [8, 8] init normal(0.02)\n" + loss % "x",
}
for name, text in models.items():
    open(f"{name}.ptm", "w").write(text)
EOF2

for kind in consts params variables blocks instances inputs; do
  t=$(seconds "$ptc" "$kind.ptm")
  rc=$?
  if [ $rc -ne 0 ]; then
    bad "40,000 $kind" "exit $rc after $t s: $(head -c 300 err.txt)"
  elif awk -v t="$t" -v m="$max" 'BEGIN { exit !(t < m) }'; then
    ok "40,000 $kind" "compiled in $t s (limit $max s)"
  else
    bad "40,000 $kind" "compiled in $t s, more than $max s: superlinear"
  fi
done

# --place: 40 stars before a name. A matcher that backtracks tries every way of spreading the
# stars over a parameter name (for 'h.0.mlp.w_fc' and 16 stars: 23 s; 40: years).
stars=$(printf '*%.0s' $(seq 40))
t=$(seconds "$ptc" --mesh tp=2 --place "${stars}wte=tp:R" "$src/examples/gpt2_tiny.ptm")
rc=$?
if [ $rc -eq 0 ] && awk -v t="$t" -v m="$max" 'BEGIN { exit !(t < m) }'; then
  ok "--place with 40 stars" "compiled in $t s"
else
  bad "--place with 40 stars" "exit $rc after $t s (limit $max s): $(head -c 300 err.txt)"
fi
finish
