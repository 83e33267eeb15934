"""The few errors clawrl raises on purpose. Each says what went wrong and how to fix it."""


class ClawrlError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class ConfigError(ClawrlError):
    """A recipe key, environment override or value is wrong; raised at start-up."""


class ModelError(ClawrlError):
    """The model could not be found, provisioned or loaded."""


class RequestError(ClawrlError):
    """A caller's mistake, answered with an OpenAI-shaped 4xx error body."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class AdapterRefused(ClawrlError):
    """An engine would not load an adapter (rank above --max-lora-rank, bad files, ...)."""
