"""The production topology on one machine, for trying it out and for the tests.

::

    python -m chatsite.prodstack run [--gateways 3] [--https-port 8443] [--http-port 8080]
                                     [--base-port 8100] [--engine-url URL] [--engine-class DOTTED]
    python -m chatsite.prodstack service-key
    python -m chatsite.prodstack render-site --listen 80 --server-name chat.example.org \\
        --upstream 127.0.0.1:8101 --upstream 127.0.0.1:8102 --static-root /srv/chatsite/staticfiles
    python -m chatsite.prodstack render-tls --listen 443 --cert FULLCHAIN.pem --key PRIVKEY.pem

``run`` (``make run-prod``) starts, all with ``chatsite.settings.production``:

- the **engine process**: uvicorn (chatsite/serve.py) with the vLLM engine, on loopback only
  (``--base-port``), the one process that holds the model; gateways and Celery jobs reach it through its
  OpenAI-compatible ``/v1`` with the service key. With ``--engine-url`` none is started and that
  server (another machine's engine process, or ``vllm serve``) is used instead.
- **N gateways**: uvicorn processes with no engine of their own
  (``CHAT_ENGINE_CLASS=inference.remote.OpenAIRemoteEngine``), on the ports after it; they serve
  the pages, the API and the answer streams.
- a **Celery worker** and **Celery beat**;
- **nginx** with the shipped site (deploy/nginx.conf, one upstream ``server`` per gateway) and
  TLS (deploy/nginx-tls.conf, a self-signed certificate made here), serving the collected static
  files itself; plain HTTP on ``--http-port`` is redirected to HTTPS by the app.

Before that it migrates (every region's database too), collects the static files and registers
the service key. It uses the environment's ``DATABASE_URL`` / ``REDIS_URL``, else starts the
embedded PostgreSQL and Redis of ``make run`` (chatsite/devstack.py). Production settings need
``DJANGO_SECRET_KEY``: when it is unset, a random one is made once and kept in the work folder
(``var/prodstack/secret-key``, mode 0600). ``--state-file`` receives a JSON description of what
runs where once everything is ready (the tests read it). Ctrl-C or SIGTERM stops everything;
a process that exits meanwhile is started again (as systemd's ``Restart=on-failure`` would).

Real deployments use the systemd units in deploy/systemd/ instead (docs/operations.md). The nginx
files (rendering, the self-signed certificate, the main configuration) are made by
chatsite/nginx_files.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chatsite import devstack
from chatsite.nginx_files import (
    nginx_binary,
    nginx_main_conf,
    render_site,
    render_tls,
    self_signed_certificate,
)  # fmt: skip
from chatsite.placement import Placement
from chatsite.serve import serve_argv

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "chatsite.settings.production"
REMOTE_ENGINE = "inference.remote.OpenAIRemoteEngine"
LOCAL_ENGINE = "inference.engine.VllmEngine"


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, proc: subprocess.Popen | None, timeout_s: float) -> bool:
    """Poll ``url`` until it answers 200 (True), ``proc`` exits or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return True
        time.sleep(1)
    return False


@dataclass
class Child:
    """A supervised process: how to start it again, and its log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    # Background work (Celery) runs at a lower CPU priority (chatsite/placement.py).
    background: bool = False

    def start(self) -> None:
        self.started_at = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=Placement.from_env(self.env).preexec(background=self.background),
            )  # fmt: skip

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@dataclass
class Stack:
    """What ``run`` started, in start order (stopped in reverse)."""

    work: Path
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], env: dict[str, str], *, background: bool = False) -> Child:
        child = Child(name, argv, env, self.work / "logs" / f"{name}.log", background=background)
        child.start()
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc is not None:
                devstack.stop_process_group(child.proc, grace_s=10)


def server_argv(port: int) -> list[str]:
    """uvicorn (chatsite/serve.py) on loopback ``port``. The client address comes from
    nginx's ``X-Real-IP`` (its ``$remote_addr``), never from a header the client wrote."""
    return serve_argv(port=port)


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py args`` with ``env``; return its stdout. Raises CalledProcessError."""
    return subprocess.run(
        [sys.executable, "manage.py", *args], env=env, cwd=ROOT, check=True,
        stdout=subprocess.PIPE, text=True,
    ).stdout  # fmt: skip


def secret_key(work: Path) -> str:
    """The local stack's secret key, made once (50 random URL-safe bytes) and kept in
    ``work/secret-key`` (0600)."""
    path = work / "secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def prepare(env: dict[str, str]) -> str:
    """Migrate every database, collect the static files, register the service key; return the
    key (``service-key``)."""
    manage(env, "migrate", "--noinput")
    regions = json.loads(env.get("CHAT_REGION_DATABASE_URLS") or "{}")
    for region in regions:
        manage(env, "migrate", "--noinput", f"--database=region_{region}")
    manage(env, "collectstatic", "--noinput", "--verbosity", "0")
    out = subprocess.run(
        [sys.executable, "-m", "chatsite.prodstack", "service-key"], env=env, cwd=ROOT, check=True,
        stdout=subprocess.PIPE, text=True,
    ).stdout  # fmt: skip
    return out.strip()


@contextlib.contextmanager
def production_env(work: Path, https_port: int) -> Iterator[dict[str, str]]:
    """The environment every process of the stack gets: production settings, the database and
    Redis (embedded ones when DATABASE_URL / REDIS_URL are unset), and local defaults for what
    production requires (secret key, hosts, static root)."""
    with devstack.stack_env() as env:
        env.pop("CHAT_TEST_DB_NAME", None)
        env["DJANGO_SETTINGS_MODULE"] = SETTINGS
        if not env.get("DJANGO_SECRET_KEY"):
            env["DJANGO_SECRET_KEY"] = secret_key(work)
            print(f"using the local secret key in {work / 'secret-key'}", flush=True)
        env.setdefault("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
        env.setdefault("DJANGO_STATIC_ROOT", str(work / "staticfiles"))
        if https_port != 443:
            # Django's HTTP -> HTTPS redirect must name the HTTPS port.
            env.setdefault("DJANGO_SECURE_SSL_HOST", f"127.0.0.1:{https_port}")
        yield env


def run(args: argparse.Namespace) -> int:
    """Start the whole stack (module docstring), wait until it serves, supervise it until
    SIGINT/SIGTERM; returns 0 after a requested stop, 1 if it never became ready."""
    work = Path(args.workdir).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "nginx").mkdir(exist_ok=True)
    stop_requested = False
    serving = False

    def on_signal(signum, frame):
        # While starting: stop at once (the finally below stops what was started). Once
        # serving: only note it; the supervision loop ends and stops everything.
        nonlocal stop_requested
        stop_requested = True
        if not serving:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    https_port = args.https_port or free_port()
    http_port = args.http_port or free_port()
    # The stack's own processes (embedded servers, gateways, the engine's scheduler, nginx) on the
    # CPUs the model's threads are not bound to (chatsite/placement.py).
    Placement.from_env().apply_here()
    with production_env(work, https_port) as env:
        stack = Stack(work)
        try:
            ports = [
                free_port() if args.base_port == 0 else args.base_port + i
                for i in range(args.gateways + 1)
            ]
            engine_url = (args.engine_url or f"http://127.0.0.1:{ports[0]}").rstrip("/")
            # Every process's background jobs reach the model there.
            env["CHAT_INTERNAL_API_URL"] = engine_url
            print("migrating, collecting static files...", flush=True)
            service_key = prepare(env)
            if not args.engine_url:
                engine_env = {
                    **env,
                    # Reached only over loopback by gateways and jobs, never through nginx.
                    "DJANGO_SECURE_SSL_REDIRECT": "off",
                }
                engine_env["CHAT_ENGINE_CLASS"] = args.engine_class or LOCAL_ENGINE
                engine = stack.spawn("engine", server_argv(ports[0]), engine_env)
                print("starting the engine process (loading the model: ~30 s)...", flush=True)
                if not wait_http_ok(f"{engine_url}/readyz", engine.proc, args.ready_timeout):
                    print(f"the engine did not become ready:\n{engine.log_tail()}", file=sys.stderr)
                    return 1
            gateway_env = {
                **env,
                "CHAT_ENGINE_CLASS": REMOTE_ENGINE,
                "CHAT_ENGINE_URL": engine_url,
                "CHAT_ENGINE_API_KEY": service_key,
            }
            gateways = [
                stack.spawn(f"gateway-{i}", server_argv(port), gateway_env)
                for i, port in enumerate(ports[1:], 1)
            ]
            stack.spawn("celery-worker", [
                sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-l", "INFO",
                "--concurrency", os.environ.get("CHAT_CELERY_CONCURRENCY", "1"),
            ], env, background=True)  # fmt: skip
            stack.spawn("celery-beat", [
                sys.executable, "-m", "celery", "-A", "chatsite", "beat", "-l", "INFO",
                "-s", str(work / "celerybeat-schedule"),
            ], env, background=True)  # fmt: skip
            start_nginx(stack, env, ports[1:], http_port, https_port)
            for gateway, port in zip(gateways, ports[1:], strict=True):
                if not wait_http_ok(
                    f"http://127.0.0.1:{port}/readyz", gateway.proc, args.ready_timeout
                ):
                    print(
                        f"{gateway.name} did not become ready:\n{gateway.log_tail()}",
                        file=sys.stderr,
                    )
                    return 1
            url = f"https://127.0.0.1:{https_port}/"
            state = {
                "url": url,
                "http_url": f"http://127.0.0.1:{http_port}/",
                "engine_url": engine_url,
                "gateways": [f"http://127.0.0.1:{port}" for port in ports[1:]],
                "static_root": env["DJANGO_STATIC_ROOT"],
                "access_log": str(work / "nginx" / "access.log"),
                "logs": str(work / "logs"),
                "pids": {c.name: c.proc.pid for c in stack.children},
            }
            if args.state_file:
                tmp = Path(args.state_file).with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=2))
                tmp.replace(args.state_file)
            print(f"\n  Production stack ready: {url} (self-signed certificate)\n"
                  f"  {args.gateways} gateways behind nginx, engine at {engine_url}; "
                  f"logs in {work / 'logs'}. Ctrl-C stops it.\n", flush=True)  # fmt: skip
            serving = True
            while not stop_requested:
                for child in stack.children:
                    # Like systemd's Restart=on-failure with RestartSec=2.
                    exited = child.proc.poll() is not None
                    if exited and not stop_requested and time.monotonic() - child.started_at > 2:
                        child.restarts += 1
                        print(f"{child.name} exited ({child.proc.returncode}); starting it again",
                              flush=True)  # fmt: skip
                        child.start()
                time.sleep(0.5)
            return 0
        except KeyboardInterrupt:
            return 0 if stop_requested else 130
        finally:
            stack.stop()


def start_nginx(
    stack: Stack, env: dict[str, str], gateway_ports: list[int], http_port: int, https_port: int
) -> Child:
    """nginx in the foreground with the shipped site and TLS snippet, rendered for this stack."""
    binary = nginx_binary()
    work = stack.work / "nginx"
    tls_dir = work / "chatsite.d"  # the site includes chatsite.d/*.conf beside the main config
    tls_dir.mkdir(exist_ok=True)
    cert, key = work / "tls-cert.pem", work / "tls-key.pem"
    if not cert.exists():
        self_signed_certificate(cert, key, ["127.0.0.1", "localhost"])
    site = work / "chatsite.conf"
    site.write_text(
        render_site(
            listen=f"127.0.0.1:{http_port}",
            server_name="_",
            upstreams=[f"127.0.0.1:{port}" for port in gateway_ports],
            static_root=env["DJANGO_STATIC_ROOT"],
        )
    )
    (tls_dir / "tls.conf").write_text(
        render_tls(listen=f"127.0.0.1:{https_port}", cert=cert, key=key)
    )
    conf = work / "nginx.conf"
    conf.write_text(nginx_main_conf(binary, work, site))
    child = stack.spawn("nginx", [
        binary, "-e", "stderr", "-p", str(work), "-c", str(conf),
        "-g", f"daemon off; pid {work}/nginx.pid; error_log stderr;",
    ], env)  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"nginx did not start:\n{child.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", https_port), 0.2):
            return child
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {https_port}:\n{child.log_tail()}")


def print_service_key() -> int:
    """Print the service key (registering it on first use): what engine-less gateways send to
    the engine process as CHAT_ENGINE_API_KEY. Derived from DJANGO_SECRET_KEY unless
    CHAT_SERVICE_API_KEY is set (accounts.services.service_api_key)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django  # noqa: PLC0415

    django.setup()
    from accounts.services import service_api_key  # noqa: PLC0415

    print(service_api_key())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m chatsite.prodstack")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="start engine, gateways, Celery and nginx")
    run_parser.add_argument("--gateways", type=int, default=int(os.environ.get("GATEWAYS", "3")))
    run_parser.add_argument(
        "--https-port",
        type=int,
        default=int(os.environ.get("HTTPS_PORT", "8443")),
        help="nginx's HTTPS port (0: any free one)",
    )
    run_parser.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ.get("HTTP_PORT", "8080")),
        help="nginx's plain-HTTP port, redirected to HTTPS (0: any free one)",
    )
    run_parser.add_argument(
        "--base-port",
        type=int,
        default=int(os.environ.get("BASE_PORT", "8100")),
        help="the engine's port; gateways use the next ones (0: free ports)",
    )
    run_parser.add_argument(
        "--engine-url",
        default=os.environ.get("CHAT_ENGINE_URL", ""),
        help="use this engine server instead of starting one",
    )
    run_parser.add_argument(
        "--engine-class",
        default="",
        help="the engine process's CHAT_ENGINE_CLASS (default: the vLLM engine)",
    )
    run_parser.add_argument("--workdir", default=str(devstack.VAR / "prodstack"))
    run_parser.add_argument("--state-file", default="")
    run_parser.add_argument("--ready-timeout", type=float, default=600)
    sub.add_parser("service-key", help="print the service key (engine-less gateways use it)")
    site_parser = sub.add_parser("render-site", help="print deploy/nginx.conf filled in")
    site_parser.add_argument("--listen", required=True)
    site_parser.add_argument("--server-name", required=True)
    site_parser.add_argument("--upstream", action="append", required=True, help="once per gateway")
    site_parser.add_argument("--static-root", required=True)
    tls_parser = sub.add_parser("render-tls", help="print deploy/nginx-tls.conf filled in")
    tls_parser.add_argument("--listen", default="443")
    tls_parser.add_argument("--cert", required=True)
    tls_parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.gateways < 1:
            parser.error("--gateways must be at least 1")
        return run(args)
    if args.command == "service-key":
        return print_service_key()
    if args.command == "render-site":
        sys.stdout.write(render_site(listen=args.listen, server_name=args.server_name,
                                     upstreams=args.upstream, static_root=args.static_root))  # fmt: skip
        return 0
    sys.stdout.write(render_tls(listen=args.listen, cert=args.cert, key=args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
