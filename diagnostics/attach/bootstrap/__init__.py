"""The attach bootstrap folder: ``sitecustomize.py`` here is what ``python -m diagnostics run`` puts first on
PYTHONPATH (a package only so that an install ships it; nothing imports it as diagnostics.attach.bootstrap)."""
