"""ASGI entry point for daphne: ``daphne chatsite.asgi:application``."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

# Static files (htmx, the chat script, CSS) are served by daphne itself on a single box; a
# production deployment behind nginx serves the collected files from nginx instead.
application = ProtocolTypeRouter({"http": ASGIStaticFilesHandler(django_asgi_app)})
