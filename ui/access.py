"""Who may use the dashboard. It runs code as the user who started it (Python-file models, the "Run a
script" page), so it listens on 127.0.0.1 unless told otherwise (``make run``, ui.launch and
.streamlit/config.toml). Served on another address it needs either an access token that every session
must give before any page draws (``TORCHSCOPE_TOKEN``, like Jupyter's), or server-safe mode: started
there without either, it turns server-safe mode on and says so.

``exposure`` (no Streamlit) is the rule, applied by the launcher before the server and the spare worker
start and again by app.py on every run (a plain ``streamlit run app.py --server.address ...``); ``gate``
is the token check app.py runs before the sidebar and the pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import sys

from diagnostics.settings import SAFE_MODE_ENV, safe_mode

#: The dashboard's access token: set it to serve other machines with every feature.
TOKEN_ENV = "TORCHSCOPE_TOKEN"
#: A token shorter than this is refused (a guessable token is no lock).
MIN_TOKEN_CHARS = 16
#: Where the dashboard listens unless told otherwise.
LOCAL_ADDRESS = "127.0.0.1"
#: The URL's query parameter that carries the token (http://host:8501/?token=...).
TOKEN_PARAM = "token"
_SESSION_KEY = "_torchscope_access"


class AccessError(Exception):
    """A token that cannot protect anything (too short): the server does not start."""


def is_local(address: str | None) -> bool:
    """Whether a server listening on ``address`` is reachable from this machine only (a loopback address).
    An empty address is Streamlit's default, every interface; a host name may resolve anywhere."""
    text = (address or "").strip().strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def token(environ=None) -> str | None:
    """The access token (TORCHSCOPE_TOKEN), or None when unset; AccessError when it is too short."""
    raw = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    if not raw:
        return None
    if len(raw) < MIN_TOKEN_CHARS:
        raise AccessError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters long (it has {len(raw)}); "
                          f"e.g. {TOKEN_ENV}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return raw


def exposure(address: str | None, environ=None) -> str | None:
    """Apply the rule for a server listening on ``address``: on another address than loopback with no
    token and not in server-safe mode, server-safe mode is turned on (in ``environ``, default this
    process' environment, which the workers inherit). Returns what to tell the user when it was."""
    environ = os.environ if environ is None else environ
    if is_local(address) or token(environ) is not None:
        return None
    if environ.get(SAFE_MODE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    environ[SAFE_MODE_ENV] = "1"
    where = address.strip() if address and address.strip() else "every network interface"
    return (f"torchscope: serving {where} without an access token: started in server-safe mode (no Python-file "
            f"or pickled-model uploads, no scripts run, no server paths read), since anyone who reaches the port "
            f"could otherwise run code as this user. To serve others with every feature, set {TOKEN_ENV} (at "
            f"least {MIN_TOKEN_CHARS} characters; each browser gives it once, or opens /?{TOKEN_PARAM}=...); to "
            f"keep it on this machine, leave --server.address at {LOCAL_ADDRESS}.")


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _server_running() -> bool:
    """Whether a Streamlit server runs in this process (AppTest runs the script with none: nothing listens)."""
    from streamlit import runtime
    from streamlit.runtime import Runtime

    return runtime.exists() and isinstance(runtime.get_instance(), Runtime)


def gate() -> None:
    """app.py, on every run before the sidebar: the address rule (a plain ``streamlit run``), then, when a
    token is set, the session must have given it (the URL's ?token= or the field shown here); until then
    the run stops here and no page, sidebar or job is reached."""
    import streamlit as st

    try:
        expected = token()
    except AccessError as e:
        st.error(str(e), icon=":material/lock:")
        st.stop()
    said = exposure(st.get_option("server.address")) if _server_running() else None
    if said:  # once: the environment says server-safe mode from now on (the sidebar says so on every page)
        print(said, file=sys.stderr, flush=True)
    if expected is None or st.session_state.get(_SESSION_KEY) == _digest(expected):
        return
    for given in (st.query_params.get(TOKEN_PARAM),
                  st.text_input("Access token", type="password", key="_torchscope_token",
                                help=f"The server's {TOKEN_ENV}.")):
        if given and hmac.compare_digest(given.encode(), expected.encode()):
            st.session_state[_SESSION_KEY] = _digest(expected)
            st.rerun()  # drawn again without the token's field
    if st.session_state.get("_torchscope_token") or st.query_params.get(TOKEN_PARAM):
        st.error("That is not this server's access token.", icon=":material/lock:")
    st.info(f"This dashboard asks for its access token ({TOKEN_ENV} on the server).", icon=":material/lock:")
    st.stop()
