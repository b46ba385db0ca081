from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """The inference layer as a Django app only for its system checks (inference/checks.py);
    it has no models."""

    name = "inference"

    def ready(self) -> None:
        from inference import checks  # noqa: F401, PLC0415 - registers the chat.* checks
