from django.apps import AppConfig


class ImportsConfig(AppConfig):
    """Bringing chat history from another product (issue 30, part 3): no models of its own."""

    name = "imports"
