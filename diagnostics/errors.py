"""User-facing errors: each message names the problem so the UI and CLI can show it verbatim.

``explain(exc)`` turns any exception into such a message: its cause kept, tensor dumps dropped, a remedy
for known causes.
"""

import re


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


# ----------------------------------------------------------------------------- explaining an exception
#: The longest explanation kept, in characters (a cause longer than this keeps its head and its tail).
MAX_EXPLAIN_CHARS = 600

_LOG_PREFIX = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]*\] ?", re.M)  # glog, as torch logs
_TENSOR_START = re.compile(r"(Parameter containing:\s*)?\b(tensor|Parameter)\(")
#: eight or more numbers in a row (an array printed in full): a dump, not a cause
_NUMBER_RUN = re.compile(r"\[?(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?,?\s*\]?,?\s*){8,}", re.I)
_TYPE_IN_REPR = re.compile(r"of type ([\w.]*\w)|Deserializing ([\w.]*\w) in pytree")

_PYTREE = ("the model's inputs or outputs use a container type{what} that the library defining it registers "
           "with torch's pytree when it is imported, and TorchScope loads a .pt2 without running that library's "
           "code. Export a wrapper whose forward returns the logits (a tensor or a tuple of tensors), e.g. "
           "`return model(ids, use_cache=False).logits`")
_TRACE_OUTPUT = ("torch.jit.trace takes only tensors and (nested) tuples of tensors as outputs{what}: wrap the "
                 "model so its forward returns the logits (a tensor or a tuple of tensors), e.g. "
                 "`return model(ids, use_cache=False).logits` (use_cache=False also drops transformers' "
                 "DynamicCache)")
_TRACE_CONTAINER = ("torch.jit.trace (strict) refuses a {what} output, since its structure could change between "
                    "calls: wrap the model to return a tuple of tensors or just its logits (torch.jit.trace("
                    "..., strict=False) accepts a {what} whose keys never change)")
_DTYPE = ("parameters and activations are in different dtypes: feed inputs in the parameters' dtype; a graph "
          "captured ahead of time (torch.export, TorchScript) keeps the dtypes it was captured with, so convert "
          "the model before capturing it")

#: known causes -> what to do: (pattern on the cleaned message, remedy, how a type named in the message
#: fills the remedy's {what})
REMEDIES: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"in pytree is not registered|not (a )?registered (as a )?pytree|unregistered pytree", re.I), _PYTREE,
     " (here {name})"),
    (re.compile(r"Tracer cannot infer type of|Only tensors and \(possibly nested\) tuples of tensors"), _TRACE_OUTPUT,
     " (this model's output holds a {name})"),
    (re.compile(r"Encountering a (dict|list) at the output of the tracer"), _TRACE_CONTAINER, ""),
    (re.compile(r"must have the same dtype|expected scalar type \w+ but found \w+|"
                r"Input type \(\w+\) and (weight|bias) type \(\w+\) should be the same|dtype mismatch", re.I), _DTYPE,
     ""),
)


def _drop_tensor_reprs(text: str) -> str:
    """Every ``tensor(...)`` / ``Parameter(...)`` repr (brackets balanced, possibly many lines) -> ``tensor(...)``."""
    out, i = [], 0
    while True:
        m = _TENSOR_START.search(text, i)
        if m is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()] + m.group(2) + "(...)")
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(text[j], 0)
            j += 1
        i = j


def _cause_of_traceback(text: str) -> str:
    """A message that embeds a Python traceback: the exception line(s) that end it."""
    if "Traceback (most recent call last):" not in text:
        return text
    head, _, tb = text.partition("Traceback (most recent call last):")
    lines = tb.splitlines()
    last_code = max((k for k, ln in enumerate(lines) if ln.startswith(" ")), default=-1)
    cause = "\n".join(lines[last_code + 1:]).strip()
    return (head.strip() + "\n" + cause).strip() if cause else text


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[:limit * 2 // 3], text[-(limit // 3):]
    return head[:head.rfind(" ") if " " in head else len(head)].rstrip() + " ... " + tail[tail.find(" ") + 1:]


def clean_message(text: str, limit: int = MAX_EXPLAIN_CHARS) -> str:
    """An error's text without log prefixes, tracebacks, tensor dumps or long number runs, on one line."""
    text = _LOG_PREFIX.sub("", text)
    text = _cause_of_traceback(text)
    text = _drop_tensor_reprs(text)
    text = _NUMBER_RUN.sub("... ", text)
    text = " ".join(ln.strip() for ln in text.splitlines() if ln.strip())
    text = re.sub(r"\s+", " ", text).strip()
    return _shorten(text, limit)


def remedy_for(text: str) -> str | None:
    """What to do about a known cause named in ``text``, or None."""
    for pattern, remedy, what in REMEDIES:
        m = pattern.search(text)
        if m is None:
            continue
        if remedy is _TRACE_CONTAINER:
            return remedy.format(what=m.group(1))
        found = _TYPE_IN_REPR.search(text)
        name = next((g for g in found.groups() if g), None) if found else None
        return remedy.format(what=what.format(name=name) if name else "")
    return None


def explain(exc: BaseException, limit: int = MAX_EXPLAIN_CHARS) -> str:
    """``Type: message``: the cause kept (the end of an embedded traceback, the part after a tensor dump),
    tensor dumps and long number runs dropped, at most ``limit`` characters, and what to do about a
    known cause (an unregistered pytree type such as transformers' ModelOutput, outputs torch.jit.trace
    refuses, a dtype mismatch)."""
    text = clean_message(str(exc), limit) or "(no message)"
    remedy = remedy_for(text)
    return f"{type(exc).__name__}: {text}" + (f" -- what to do: {remedy}" if remedy else "")
