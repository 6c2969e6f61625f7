"""Run a script: your own training script, unmodified, profiled while it runs (``python -m diagnostics
run`` in a process of its own); live step counter and phase, Stop, then its result."""

import os

import streamlit as st

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

st.caption(f"Scripts run as **{os.environ.get('USER') or os.getuid()}**, the user who started the dashboard.")
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

if st.button("Run", type="primary", disabled=busy or not line.strip(), key="attach_go"):
    from diagnostics.attach.background import BackgroundRun

    try:
        st.session_state[RUN_KEY] = run = BackgroundRun(
            line, cwd or os.getcwd(), steps=int(steps), at=int(at) if at >= 2 else None,
            timeout_s=float(timeout) or None, data_dir=str(get_store().data_dir))
    except TorchScopeError as e:
        st.error(str(e))
        run = None
    busy = run is not None


def _panel(run) -> None:
    s = run.status()
    if s.get("done") or run.done:
        st.rerun()
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
        elif rec.status != "ok":
            st.warning(rec.error or rec.status)
        if rec.result:
            views.show_stored("attach", rec.result, file_stem=rec.id)  # the store keeps the plain form
else:
    st.info("Give the command and press Run. The result also lands in History.")
