"""Runbooks: YAML procedures of `fleetctl` steps, checked, confirmed, run and audited (docs/runbooks/README.md).

model.py (the format), load.py (YAML to model, errors with their line), errors.py, commands.py
(resolving a command in the CLI's command tree, which the CLI hands in), validate.py, template.py (`{var}`
substitution), variables.py (`--var` and defaults), jsonpath.py and compare.py (what a check reads and how
it compares), runner.py (the step executor), shipped.py (where the shipped runbooks are).
"""
