

def test_the_dashboard_starts_on_a_corrupt_run_store_and_says_so_once(new_app, tmp_path, monkeypatch):
    from ui.jobs import get_store

    (tmp_path / "runs.sqlite").write_bytes(b"overwritten by a model: not a database" * 200)
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path))
    get_store.clear()  # a store for this data folder, as a fresh dashboard process would open
    try:
        at = new_app()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        notes = [w.value for w in at.sidebar.warning if "moved aside" in w.value]
        assert len(notes) == 1 and "runs.sqlite.corrupt-" in notes[0]
        assert list(tmp_path.glob("runs.sqlite.corrupt-*"))
        at.run()  # said once per session
        assert not [w for w in at.sidebar.warning if "moved aside" in w.value]
    finally:
        get_store.clear()


def test_the_dashboard_names_a_run_store_it_cannot_write_and_stops(new_app, tmp_path, monkeypatch):
    from ui.jobs import get_store

    (tmp_path / "data").write_text("a file where the data folder should be")
    monkeypatch.setenv("TORCHSCOPE_DATA_DIR", str(tmp_path / "data"))
    get_store.clear()
    try:
        at = new_app()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert [e.value for e in at.error] == [f"the run store's folder {tmp_path / 'data' / 'artifacts'} could not be "
                                               "made: Not a directory; set TORCHSCOPE_DATA_DIR to a writable folder"]
    finally:
        get_store.clear()
