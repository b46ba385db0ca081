"""ASGI entry point: ``python -m chatsite.serve`` (uvicorn, chatsite/serve.py) serves ``application``."""

import os

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


# The classifiers and the embedding model load in the background; /readyz says "warming up"
# until they have (chatsite/warmup.py).
from chatsite import warmup  # noqa: E402

warmup.start()
