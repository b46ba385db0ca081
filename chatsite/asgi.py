"""ASGI entry point: ``python -m chatsite.serve`` (uvicorn, chatsite/serve.py) serves ``application``."""

import logging
import os
import threading

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

# The ASGI server runs no system checks: refuse to start on an invalid model-pool or routing
# configuration (the checks `manage.py check` runs, inference/checks.py), with their messages.
from django.core import checks  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

_config_errors = [e for e in checks.run_checks(tags=["chat"]) if e.is_serious()]
if _config_errors:
    raise ImproperlyConfigured("; ".join(f"{e.id}: {e.msg}" for e in _config_errors))

# Static files (htmx, the chat script, CSS) are served by the app itself on a single box; a
# production deployment behind nginx serves the collected files from nginx instead.
application = ProtocolTypeRouter({"http": ASGIStaticFilesHandler(django_asgi_app)})


def _warm_up() -> None:
    """Load the moderation classifiers (the first check loads and trains them, ~1 s) so the
    first turn is not refused for a check that timed out (settings.CHAT_MODERATION_TIMEOUT_S),
    and the memory embedding model (~1-2 s) so the first turn with memory does not wait for
    it. Either failing is logged and shows on the first turn (moderation fails closed)."""
    from moderation.base import moderator  # noqa: PLC0415
    from moderation.verdicts import policy_for  # noqa: PLC0415

    try:
        checker = moderator()
        checker.check_input("warm-up", policy_for(None))
        checker.check_output("warm-up", policy_for(None))
    except Exception:  # noqa: BLE001
        logging.getLogger(__name__).exception("moderation warm-up failed")
    if getattr(settings, "CHAT_MEMORY_ENABLED", False):
        try:
            from memory.embeddings import embeddings_warm  # noqa: PLC0415

            embeddings_warm()
        except Exception:  # noqa: BLE001
            logging.getLogger(__name__).exception("memory embedding warm-up failed")


threading.Thread(target=_warm_up, name="warm-up", daemon=True).start()
