from relayer.cli import run

run()
