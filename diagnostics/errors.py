"""User-facing errors: each message names the problem so the UI and CLI can show it verbatim."""


class TorchScopeError(Exception):
    """Base of every error the user should read (bad input, a model that fails, a job limit)."""


class SpecError(TorchScopeError):
    """A model or input description that cannot be valid (bad shape, unknown dtype...)."""


class ModelLoadError(TorchScopeError):
    """The model could not be loaded from what the user gave."""


class ModelRunError(TorchScopeError):
    """The user's model raised while running; the message carries the model's own error."""


class TrustError(ModelLoadError):
    """A file that can run code on load was offered without the trust switch."""


class JobError(TorchScopeError):
    """The worker running a job timed out, crashed, ran out of memory or was cancelled."""
