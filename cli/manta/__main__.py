from manta.cli import app

app(prog_name="manta")
