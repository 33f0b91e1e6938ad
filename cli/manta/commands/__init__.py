"""The commands of the `manta` CLI, grouped by what they are about; cli.py assembles them."""
