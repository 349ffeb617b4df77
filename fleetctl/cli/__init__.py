"""The `fleetctl` command line (typer): `fleetctl NOUN VERB`. Entry point: fleetctl.cli.main:main."""
