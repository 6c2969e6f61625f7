"""The optimization checklist: facts about a model (facts.py), rules over them (rules.py) and
reports (report.py). The pipeline: collect_facts -> evaluate (RULES) -> score -> report."""
