#!/usr/bin/env python3
"""Extracts one novel from the Debian package r-cran-janeaustenr as plain text (no R needed).

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
    python3 extract_janeaustenr.py pkg/usr/lib/R/site-library/janeaustenr prideprejudice > corpus.txt

The package keeps each novel as an R character vector (one element per line) in its lazy-load
database: data/Rdata.rdx (gzip'd R serialization: a list whose "variables" entry maps each name to
an [offset, length] pair) and data/Rdata.rdb (at that offset: a 4-byte big-endian length, then a
zlib stream of the serialized vector). This reads just enough of R's XDR serialization format for
those two objects, and prints the lines joined by newlines.
"""
import gzip
import struct
import sys
import zlib


class RReader:
    """A reader for the subset of R's serialization format ("X\\n", version 2 or 3) used here."""

    def __init__(self, data):
        if data[:2] != b"X\n":
            raise ValueError("not XDR-serialized R data")
        self.d, self.p, self.refs = data, 2, []
        version = self.int()
        self.int()  # writer version
        self.int()  # minimal reader version
        if version == 3:
            n = self.int()  # then the native encoding's name
            self.p += n

    def int(self):
        (v,) = struct.unpack(">i", self.d[self.p : self.p + 4])
        self.p += 4
        return v

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:  # NILVALUE_SXP
            return None
        if kind == 255:  # REFSXP
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if kind == 1:  # SYMSXP
            sym = self.item()
            self.refs.append(sym)
            return sym
        if kind == 2:  # LISTSXP (pairlist): [attr] [tag] car cdr
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            rest = self.item() or []
            return [(tag, car)] + rest
        if kind == 9:  # CHARSXP
            n = self.int()
            if n < 0:
                return None
            s = self.d[self.p : self.p + n].decode("utf-8")
            self.p += n
            return s
        n = self.int()
        if kind in (10, 13):  # LGLSXP, INTSXP
            value = [self.int() for _ in range(n)]
        elif kind == 16:  # STRSXP
            value = [self.item() for _ in range(n)]
        elif kind == 19:  # VECSXP
            value = [self.item() for _ in range(n)]
        else:
            raise ValueError("unsupported R type %d" % kind)
        if has_attr:
            attrs = dict(self.item())
            if "names" in attrs:
                value = dict(zip(attrs["names"], value))
        return value


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: extract_janeaustenr.py PACKAGE_DIR NOVEL  (e.g. prideprejudice)")
    pkg, novel = sys.argv[1], sys.argv[2]
    index = RReader(gzip.decompress(open(pkg + "/data/Rdata.rdx", "rb").read())).item()
    if novel not in index["variables"]:
        sys.exit("no novel %r; the package has %s" % (novel, ", ".join(index["variables"])))
    offset, length = index["variables"][novel]
    blob = open(pkg + "/data/Rdata.rdb", "rb").read()[offset : offset + length]
    (size,) = struct.unpack(">I", blob[:4])
    data = zlib.decompress(blob[4:])
    assert len(data) == size
    lines = RReader(data).item()
    sys.stdout.write("\n".join(line or "" for line in lines) + "\n")


if __name__ == "__main__":
    main()
