"""Certificates for TLS tests, made with Debian's ``openssl``: a CA, a server certificate for
127.0.0.1 and localhost, client certificates, and a second CA that trusts none of them.
CONSTRUCTED: keys are EC P-256, valid for a day, written under one directory."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclass(frozen=True)
class Certs:
    ca: str
    server: Pair
    client: Pair
    other_ca: str
    stranger: Pair  # a client certificate the other CA signed


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[str, str]:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1",
             "-subj", f"/CN=gpuwarden test {name}", cwd=d)  # fmt: skip
    return str(d / f"{name}.pem"), str(d / f"{name}.key")


def _leaf(d: Path, name: str, ca: tuple[str, str], ext: str) -> Pair:
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca[0], "-CAkey", ca[1],
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
             "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    return Pair(str(d / f"{name}.pem"), str(d / f"{name}.key"))


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    other = _ca(directory, "other-ca")
    server = _leaf(directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth\n")  # fmt: skip
    client = _leaf(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    stranger = _leaf(directory, "stranger", other, "extendedKeyUsage=clientAuth\n")
    return Certs(ca[0], server, client, other[0], stranger)
