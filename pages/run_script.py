"""Run a script: your own training script, unmodified, profiled while it runs (``python -m diagnostics
run`` in a process of its own); live step counter and phase, Stop, then its result."""

import os

import streamlit as st

from diagnostics.analyses.trials.protocol import FIXES, suggested_fixes
from diagnostics.attach.session import only_exit_code
from diagnostics.errors import TorchScopeError
from diagnostics.settings import safe_mode
from ui import views
from ui.frame import require_app
from ui.jobs import get_store

require_app()

#: The session's run: a diagnostics.attach.background.BackgroundRun (kept across reruns and pages).
RUN_KEY = "attach_run"
PHASE_ICON = {"starting": ":material/hourglass_top:", "warming up": ":material/local_fire_department:",
              "profiling": ":material/timer:", "running": ":material/directions_run:", "done": ":material/check:"}

#: The "Try fixes" multiselect's key; TRY_FOR_KEY: the run whose findings last ticked it.
TRY_KEY, TRY_FOR_KEY = "trials_fixes", "trials_suggested_for"


def _user_name() -> str:
    """The account's name ('root', not uid 0): USER is unset under many service managers and containers."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        return os.environ.get("USER") or f"uid {os.getuid()}"


def _suggest_from_last_run(run) -> None:
    """Tick the fixes the findings of the session's last attached run point to (once per run)."""
    if run is None or not run.done or getattr(run, "trials", False):
        return
    run_id = run.status().get("run_id")
    if not run_id or st.session_state.get(TRY_FOR_KEY) == run_id:
        return
    rec = get_store().get(run_id)
    if rec is None or not rec.result:
        return
    from diagnostics.registry import get_analysis
    from diagnostics.results import decode

    try:
        findings = decode(get_analysis("attach"), rec.result).findings
    except TorchScopeError:
        return
    st.session_state[TRY_FOR_KEY] = run_id
    names = [f.split("=")[0] for f in suggested_fixes(findings)]
    if names:
        st.session_state[TRY_KEY] = names


st.title("Run a script")
st.caption("Your own training script, unmodified: it runs as it would from a terminal (same arguments, working "
           "folder, environment), with a bootstrap on PYTHONPATH that times each step's parts and profiles a few "
           "steps after warm-up, in every process (torchrun's ranks too). From a terminal: "
           "`python -m diagnostics run -- python train.py`.")

if safe_mode():
    st.warning("Running scripts is off in server-safe mode: this page runs any command you give it, as the user "
               "who started the dashboard, with that user's files and network. Run it from a terminal instead "
               "(`python -m diagnostics run -- python train.py`) and open the result in History.",
               icon=":material/block:")
    st.stop()

st.caption(f"Scripts run as **{_user_name()}**, the user who started the dashboard.")
run = st.session_state.get(RUN_KEY)
busy = run is not None and not run.done
c1, c2 = st.columns([3, 2])
line = c1.text_input("Command", key="attach_cmd", persist_state="session", disabled=busy,
                     placeholder="python train.py --epochs 1   ·   python -m pkg.train   ·   torchrun --nproc-per-node 2 "
                                 "train.py",
                     help="python SCRIPT ..., python -m MODULE ..., torchrun [its args] SCRIPT ..., or any program "
                          "that starts Python")
cwd = c2.text_input("Working folder", key="attach_cwd", value=os.getcwd(), persist_state="session", disabled=busy)
c1, c2, c3 = st.columns(3)
steps = c1.number_input("Profiled steps", min_value=1, max_value=1000, value=5, key="attach_steps",
                        persist_state="session", disabled=busy)
at = c2.number_input("Profile from step (0: after warm-up)", min_value=0, value=0, key="attach_at",
                     persist_state="session", disabled=busy,
                     help="0 waits until the step time is stable; K profiles steps K .. K + steps - 1")
timeout = c3.number_input("Stop after (s, 0: never)", min_value=0, value=0, key="attach_timeout",
                          persist_state="session", disabled=busy)
c1, c2 = st.columns([1, 2])
plan_on = c1.checkbox("Plan its memory", key="attach_plan", persist_state="session", disabled=busy,
                      help="the memory plan of the job the script really runs (its model, optimizer, batch, dtype), "
                           "made in its process at its first optimizer step's end on fake copies, beside the peak "
                           "this run measures (docs/attach.md, 'Planning the job's memory')")
plan_spec = c2.text_input("Plan also", key="attach_plan_spec", persist_state="session", disabled=busy or not plan_on,
                          placeholder="batch=2x,4x;seq=2x;dtype=bf16;shard=zero3,ranks=8",
                          help="rows beside the script's own configuration: batch multiples or sizes, sequence "
                               "lengths (seq=2x,1024: token inputs, each from its own length), dtypes, shardings "
                               "(shard=zero1,zero3,ranks=8), a device (default: the one the model is on); probe=yes "
                               "counts kernel scratch (convolutions, batch norm) by running those ops once on real "
                               "tensors")

# -- Try fixes (issue 40): the script run as it is and with each fix, in interleaved rounds with an A/A control.
_suggest_from_last_run(run)
with st.expander("Try fixes", expanded=bool(st.session_state.get(TRY_KEY))):
    st.caption("Each fix applied without editing the script (the bootstrap does it), each candidate a fresh run of "
               "the script, in rounds in a random order with the script as it is twice (the A/A control): the "
               "speed-up with its interval, the loss difference and peak memory per fix, and the change to make. "
               "The fixes the last run's findings point to are ticked. From a terminal: "
               "`python -m diagnostics run --try amp_bf16,loader_workers=4 -- python train.py`.")
    t1, t2, t3, t4 = st.columns([3, 1, 1, 1])
    chosen = t1.multiselect("Fixes", options=list(FIXES), key=TRY_KEY, disabled=busy,
                            format_func=lambda n: f"{n}=N" if FIXES[n][0] == "int" else n,
                            help="; ".join(f"{n}: {FIXES[n][1]}" for n in FIXES))
    n_value = t2.number_input("N (workers, prefetch)", min_value=1, max_value=64, key="trials_n", value=4,
                              persist_state="session", disabled=busy)
    rounds = t3.number_input("Rounds", min_value=1, max_value=100, value=6, key="trials_rounds",
                             persist_state="session", disabled=busy,
                             help="each runs the script once per candidate; 6 is the fewest that give a 95% interval")
    try_steps = t4.number_input("Timed steps", min_value=1, max_value=10000, value=10, key="trials_steps",
                                persist_state="session", disabled=busy,
                                help="steps timed per run, after 3 warm-up steps (whose losses are compared)")
    try_go = st.button("Try fixes", disabled=busy or not line.strip() or not chosen, key="attach_try",
                       icon=":material/science:")

go = st.button("Run", type="primary", disabled=busy or not line.strip(), key="attach_go")
if go or try_go:
    from diagnostics.attach.background import BackgroundRun

    fixes = ",".join(f"{n}={int(n_value)}" if FIXES[n][0] == "int" else n for n in chosen) if try_go else None
    try:
        st.session_state[RUN_KEY] = run = BackgroundRun(
            line, cwd or os.getcwd(), steps=int(try_steps if try_go else steps),
            at=int(at) if at >= 2 and not try_go else None,
            timeout_s=float(timeout) or None, data_dir=str(get_store().data_dir), try_fixes=fixes,
            rounds=int(rounds) if try_go else None, plan=plan_spec.strip() if plan_on else None)
    except TorchScopeError as e:
        st.error(str(e))
        run = None
    busy = run is not None


def _panel(run) -> None:
    s = run.status()
    if s.get("done") or run.done:
        st.rerun()
    if getattr(run, "trials", False):
        box = st.status(f"Trying fixes · {s['elapsed_s']:.0f} s", state="running", expanded=True)
        box.progress(min(1.0, float(s.get("fraction") or 0.0)),
                     text=s.get("message") or "starting the first run of the script")
        box.caption(f"{s.get('runs', 0)} run(s) of the script done")
        box.button("Stop", key="attach_stop", on_click=run.stop, disabled=s.get("stopping"), icon=":material/stop:",
                   help="Stop the trials and every process of the current run; the rounds measured are kept")
        if s.get("stopping"):
            box.caption("Stopping: the current run got Ctrl-C; its process tree is killed if it does not end in 10 s.")
        box.code(run.log_tail()[-4000:] or "(no output yet)", language=None)
        return
    phase = s.get("phase", "starting")
    window = s.get("window")
    what = f"step {s.get('step', 0)}" + (f" · profiling steps {window[0]}-{window[1]}" if window else "")
    box = st.status(f"{phase.capitalize()} · {what} · {s['elapsed_s']:.0f} s", state="running", expanded=True)
    box.button("Stop", key="attach_stop", on_click=run.stop, disabled=s.get("stopping"), icon=":material/stop:",
               help="Stop the script and everything it started; what was measured is kept")
    if s.get("stopping"):
        box.caption("Stopping: the script got Ctrl-C; its process tree is killed if it does not end in 10 s.")
    box.code(run.log_tail()[-4000:] or "(no output yet)", language=None)


if run is not None and not run.done:
    st.fragment(run_every=1.0)(lambda: _panel(run))()
elif run is not None:
    s = run.status()
    rec = get_store().get(s["run_id"]) if s.get("run_id") else None
    with st.expander("The script's output", expanded=rec is None):
        st.code(run.log_tail() or "(none)", language=None)
    if rec is None:
        st.error(f"The run did not finish normally (the tool exited with {s.get('tool_exit_code')}): see its output.")
    else:
        if rec.status == "cancelled":  # the Stop button: said as a stop, the partial result below
            st.info(rec.error or "Stopped.", icon=":material/stop_circle:")
        elif rec.status != "ok" and not (rec.result and only_exit_code(rec.error)):
            st.warning(rec.error or rec.status)  # the result's own view says a bare non-zero exit code
        if rec.result:  # the store keeps the plain form
            views.show_stored(rec.analysis, rec.result, file_stem=rec.id)
else:
    st.info("Give the command and press Run. The result also lands in History.")
