"""Shared by the test scripts: where a script writes what it timed itself."""
import json
import os


def save(timing: dict) -> None:
    path = os.environ.get("SELF_TIMING")
    if path:
        with open(path, "w") as f:
            json.dump(timing, f)


def leftovers(model, optimizer) -> dict:
    """What is on the script's model and optimizer at its end, for a bare and an attached run to compare:
    module hooks, each module's and the optimizer's attribute names, the optimizer's own step hooks, and
    whether the model pickles and deep-copies."""
    import copy
    import hashlib
    import pickle

    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_state_dict_hooks", "_load_state_dict_pre_hooks", "_forward_hooks_with_kwargs")
    out = {"hooks": [f"{n}.{k}" for n, m in model.named_modules() for k in names if getattr(m, k, None)]}
    attrs = "\n".join(sorted(f"{n}.{a}" for n, m in model.named_modules() for a in vars(m)))
    out["module_attrs"] = hashlib.sha256(attrs.encode()).hexdigest()
    for what, fn in (("pickles", lambda: len(pickle.dumps(model)) > 0),
                     ("deepcopy", lambda: type(copy.deepcopy(model)) is type(model))):
        try:
            out[what] = fn()
        except Exception as e:  # noqa: BLE001 - the same failure bare and attached is what the test compares
            out[what] = f"{type(e).__name__}: {e}"
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's / Lightning's wrapper holds torch's
    out["opt_attrs"] = sorted(vars(optimizer)) + (sorted(vars(inner)) if inner is not optimizer else [])
    out["opt_hooks"] = len(inner._optimizer_step_pre_hooks) + len(inner._optimizer_step_post_hooks)
    return out
