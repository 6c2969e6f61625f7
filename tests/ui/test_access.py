"""Who may use the dashboard (issue 45, item 7; ui/access.py): 127.0.0.1 by default; served on another
address, an access token that every session gives before any page, or server-safe mode, said so. The
real server's listening socket: tests/e2e/test_listen_address.py."""

import pytest

from diagnostics.settings import SAFE_MODE_ENV, safe_mode
from ui import access, launch

GOOD_TOKEN = "a-token-long-enough-1234"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in (SAFE_MODE_ENV, access.TOKEN_ENV, "STREAMLIT_SERVER_ADDRESS"):
        monkeypatch.setenv(name, "")  # recorded, so what launch.main sets in os.environ is undone after the test
        monkeypatch.delenv(name)


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.0.0.53", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("", False), (None, False), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("example.org", False),
])
def test_only_loopback_addresses_are_this_machine_only(address, local):
    assert access.is_local(address) is local


def test_a_loopback_server_changes_nothing():
    env = {}
    assert access.exposure("127.0.0.1", env) is None and env == {}


@pytest.mark.parametrize("address, says", [("0.0.0.0", "serving 0.0.0.0"), ("", "serving every network interface")])
def test_another_address_without_a_token_turns_server_safe_mode_on_and_says_so(address, says):
    env = {}
    said = access.exposure(address, env)
    assert env == {SAFE_MODE_ENV: "1"}
    assert said.startswith(f"torchscope: {says} without an access token: started in server-safe mode"), said
    assert access.TOKEN_ENV in said and "127.0.0.1" in said


def test_a_token_or_safe_mode_already_on_leaves_the_setting_alone():
    env = {access.TOKEN_ENV: GOOD_TOKEN}
    assert access.exposure("0.0.0.0", env) is None and SAFE_MODE_ENV not in env
    env = {SAFE_MODE_ENV: "yes"}
    assert access.exposure("0.0.0.0", env) is None and env == {SAFE_MODE_ENV: "yes"}


def test_a_short_token_is_refused_by_name():
    with pytest.raises(access.AccessError, match=f"{access.TOKEN_ENV} must be at least 16 characters long "
                                                  r"\(it has 6\)"):
        access.exposure("0.0.0.0", {access.TOKEN_ENV: "secret"})


@pytest.mark.parametrize("args, address, added", [
    ([], "127.0.0.1", True),
    (["--server.port", "9000"], "127.0.0.1", True),
    (["--server.address", "0.0.0.0"], "0.0.0.0", False),
    (["--server.address=10.1.2.3", "--server.port", "1"], "10.1.2.3", False),
])
def test_the_launcher_listens_on_loopback_unless_told_otherwise(args, address, added):
    out, where = launch.server_address(args)
    assert where == address
    assert out == (args + ["--server.address", "127.0.0.1"] if added else args)


def test_the_launcher_reads_streamlits_own_variable(monkeypatch):
    monkeypatch.setenv("STREAMLIT_SERVER_ADDRESS", "0.0.0.0")
    assert launch.server_address([]) == ([], "0.0.0.0")


def _run_main(monkeypatch, args):
    """launch.main without a server: what the spare would inherit, and what Streamlit is given."""
    seen = {}

    def spares():
        seen["safe_at_spare_start"] = safe_mode()
        return ()

    monkeypatch.setattr(launch, "start_spares_early", spares)
    monkeypatch.setattr(launch, "_hook_server_start", lambda expected: True)
    from streamlit.web import cli

    monkeypatch.setattr(cli, "main", lambda args, prog_name: seen.setdefault("args", args))
    launch.main(args)
    return seen


def test_served_everywhere_without_a_token_the_spare_starts_in_server_safe_mode(monkeypatch, capsys):
    seen = _run_main(monkeypatch, ["--server.address", "0.0.0.0"])
    assert seen["safe_at_spare_start"] is True
    assert "started in server-safe mode" in capsys.readouterr().err
    monkeypatch.delenv(SAFE_MODE_ENV)
    seen = _run_main(monkeypatch, [])
    assert seen["safe_at_spare_start"] is False
    assert seen["args"][-2:] == ["--server.address", "127.0.0.1"]


def test_the_launcher_refuses_a_short_token(monkeypatch):
    monkeypatch.setenv(access.TOKEN_ENV, "short")
    with pytest.raises(SystemExit, match="at least 16 characters"):
        _run_main(monkeypatch, ["--server.address", "0.0.0.0"])


# ---- the token, checked by app.py before any page ------------------------------------------------------

def _page_drawn(at) -> bool:
    return any(r.key == "sb_source" for r in at.sidebar.radio)


def test_with_a_token_no_page_is_drawn_until_the_session_gives_it(new_app, monkeypatch):
    monkeypatch.setenv(access.TOKEN_ENV, GOOD_TOKEN)
    at = new_app()
    at.run()
    assert not at.exception and not _page_drawn(at)
    assert any("asks for its access token" in i.value for i in at.info)
    at.text_input(key="_torchscope_token").set_value("wrong-token-of-some-length").run()
    assert not _page_drawn(at) and any("not this server's access token" in e.value for e in at.error)
    at.text_input(key="_torchscope_token").set_value(GOOD_TOKEN).run()
    assert not at.exception and _page_drawn(at)
    at.run()  # the session stays in
    assert _page_drawn(at)


def test_the_token_may_come_in_the_url(new_app, monkeypatch):
    monkeypatch.setenv(access.TOKEN_ENV, GOOD_TOKEN)
    at = new_app()
    at.query_params[access.TOKEN_PARAM] = GOOD_TOKEN
    at.run()
    assert not at.exception and _page_drawn(at)
    other = new_app()
    other.query_params[access.TOKEN_PARAM] = "not-the-token-at-all"
    other.run()
    assert not _page_drawn(other)


def test_without_a_token_set_the_pages_are_drawn_as_before(new_app):
    at = new_app()
    at.run()
    assert not at.exception and _page_drawn(at)


def test_a_plain_streamlit_run_on_every_interface_turns_server_safe_mode_on(new_app, monkeypatch, capsys):
    """app.py applies the rule itself (``streamlit run app.py --server.address 0.0.0.0``, no launcher): the
    first session's run turns server-safe mode on, before the sidebar offers Python-file uploads."""
    from streamlit import config

    monkeypatch.setattr(access, "_server_running", lambda: True)  # AppTest runs the script with no server
    old = config.get_option("server.address")
    config.set_option("server.address", "0.0.0.0")
    try:
        at = new_app()
        at.run()
        at.sidebar.radio(key="sb_source").set_value("Upload a file").run()
    finally:
        config.set_option("server.address", old)
    assert not at.exception
    assert safe_mode()
    assert "serving 0.0.0.0 without an access token: started in server-safe mode" in capsys.readouterr().err
    kinds = list(at.sidebar.selectbox(key="sb_upload_kind").options)
    assert not any("Python" in k or "ickle" in k for k in kinds), kinds
