"""The Python API reference (docs/src/reference/python.md) names what the package exposes: every
exported name, and every keyword of `Client` and `Client.run`."""

import inspect
from pathlib import Path

import fl_client

PAGE = Path(__file__).resolve().parents[2] / "docs" / "src" / "reference" / "python.md"


def names_on_the_page():
    return PAGE.read_text()


def test_every_exported_name_is_documented():
    page = names_on_the_page()
    missing = [n for n in fl_client.__all__ if n != "__version__" and f"`{n}" not in page]
    assert not missing, f"{PAGE} does not document {missing}"


def test_every_keyword_of_client_and_run_is_documented():
    page = names_on_the_page()
    params = list(inspect.signature(fl_client.Client).parameters)
    params += list(inspect.signature(fl_client.Client.run).parameters)
    missing = [p for p in params if p != "self" and f"`{p}`" not in page]
    assert params, "no signature found"
    assert not missing, f"{PAGE} does not document the arguments {missing}"
