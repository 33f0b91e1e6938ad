import os

# Hypothesis keeps its caches beside the other test artefacts (tests/settings.py), not in the
# checkout.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", "/tmp/manta-test-hypothesis")
