"""The quality canary: golden-set probes per replica class and batch condition, sequential drift tests over
their scores, verdicts that gate rollouts, and drills that prove the detector fires.

- `types`: the shared plain data (golden sets, references, probe outputs and scores, streams, verdicts);
- `golden`: the golden-set file format and its validation; `golden/` ships sets for SmolLM2 and the tiny model;
- `probe_client`: one golden prompt through the gateway (pinned or on the production path), with fillers;
- `record`: a reference from a known-good class revision, with its run-to-run noise;
- `scoring`: one probe's output against the reference (pure);
- `cusum`, `sprt`: the sequential tests and their thresholds from a false-alarm target (pure);
- `verdict`: streams of scores -> verdicts per class revision and batch condition (pure);
- `schedule`: which probes to send now, within the budget (pure).
"""
