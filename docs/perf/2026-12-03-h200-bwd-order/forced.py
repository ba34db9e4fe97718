"""pytest plugin (-p forced): the GPU backward tests on decide.py's forced tables."""
import choice
C = choice.patch("forced")


def pytest_report_header(config):
    return f"forced: {C!r}"
