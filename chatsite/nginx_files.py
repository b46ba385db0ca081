"""The nginx files of a deployment, rendered from the shipped templates: the site
(deploy/nginx.conf, one upstream ``server`` per gateway) and TLS (deploy/nginx-tls.conf), a
self-signed certificate for trying TLS out, and the main configuration the local production
stack (chatsite/prodstack.py) runs nginx with. ``python -m chatsite.prodstack render-site`` /
``render-tls`` print the first two for a real deployment (docs/operations.md).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_TEMPLATE = ROOT / "deploy" / "nginx.conf"
TLS_TEMPLATE = ROOT / "deploy" / "nginx-tls.conf"


def render_template(text: str, values: dict[str, str | list[str]]) -> str:
    """Fill ``{{NAME}}`` placeholders of a shipped nginx file, as deploy/README.md's sed does.

    Comment lines are left alone. A value that is a list repeats each line holding its
    placeholder once per item (``server {{UPSTREAM}};`` becomes one ``server`` line per
    gateway). Raises ValueError for a placeholder without a value or a value never used (a
    template and its renderer out of step).
    """
    out: list[str] = []
    used: set[str] = set()
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        copies = [line]
        for name, value in values.items():
            token = "{{" + name + "}}"
            if token not in line:
                continue
            used.add(name)
            items = value if isinstance(value, list) else [value]
            copies = [copy.replace(token, item) for copy in copies for item in items]
        for copy in copies:
            if "{{" in copy:
                raise ValueError(f"no value for the placeholder in: {copy.strip()!r}")
        out.extend(copies)
    if unused := set(values) - used:
        raise ValueError(f"placeholders not in the template: {sorted(unused)}")
    return "".join(out)


def render_site(
    *, listen: str, server_name: str, upstreams: list[str], static_root: Path | str
) -> str:
    """deploy/nginx.conf for ``upstreams`` (``host:port`` of each gateway)."""
    if not upstreams:
        raise ValueError("at least one upstream (gateway address) is needed")
    return render_template(
        SITE_TEMPLATE.read_text(),
        {
            "LISTEN": listen,
            "SERVER_NAME": server_name,
            "UPSTREAM": list(upstreams),
            "STATIC_ROOT": str(static_root).rstrip("/"),
        },
    )


def render_tls(*, listen: str, cert: Path | str, key: Path | str) -> str:
    """deploy/nginx-tls.conf: the site's HTTPS listener and certificate."""
    return render_template(
        TLS_TEMPLATE.read_text(), {"TLS_LISTEN": listen, "TLS_CERT": str(cert), "TLS_KEY": str(key)}
    )


def self_signed_certificate(cert_path: Path, key_path: Path, hosts: Iterable[str]) -> None:
    """A self-signed certificate (EC P-256, 30 days) for ``hosts`` (names and IP addresses):
    for trying HTTPS out locally only. Uses ``cryptography`` (a mozilla-django-oidc dependency)."""
    import ipaddress  # noqa: PLC0415

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chatsite prodstack (local)")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def nginx_binary() -> str:
    """nginx's path (Debian installs it in /usr/sbin). Raises RuntimeError if it is missing."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if found is None:
        raise RuntimeError("nginx is missing: run `make nginx` (apt-get install nginx-light)")
    return found


def nginx_main_conf(binary: str, work: Path, site: Path) -> str:
    """A main nginx.conf around the site, like Debian's /etc/nginx/nginx.conf (mime types,
    sendfile), with every file nginx writes under ``work`` (so it runs as any user) and an
    access log that records which gateway served each request (``upstream=``)."""
    built = subprocess.run([binary, "-V"], capture_output=True, text=True).stderr
    temp_paths = [f"client_body_temp_path {work}/client_body;", f"proxy_temp_path {work}/proxy;"]
    for module in ("fastcgi", "uwsgi", "scgi"):
        if f"--without-http_{module}_module" not in built:
            temp_paths.append(f"{module}_temp_path {work}/{module};")
    # As root, nginx's workers would run as `nobody`, which may not read the work folder.
    user = "user root;" if os.geteuid() == 0 else ""
    temp = "\n    ".join(temp_paths)
    return f"""{user}
worker_processes 2;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    log_format chatsite '$remote_addr [$time_local] "$request" $status $body_bytes_sent '
                        'upstream=$upstream_addr rt=$request_time';
    access_log {work}/access.log chatsite;
    {temp}
    include {site};
}}
"""
