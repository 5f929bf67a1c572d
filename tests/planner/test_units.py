"""Human-scaled numbers in plans and reports."""

from superoffload import units


def test_counts_scale_to_the_model():
    assert units.count(512) == "512"
    assert units.count(930_000) == "0.93M"
    assert units.count(23_000_000_000) == "23.0B"
    assert units.count(124_439_808) == "124M"
    assert units.count(1.2e12) == "1.20T"


def test_bytes_and_rates():
    assert units.nbytes(414e9) == "414 GB" and units.nbytes(34e6) == "34.0 MB" and units.nbytes(12) == "12 B"
    assert units.rate(0.05123) == "0.0512" and units.rate(412.3) == "412" and units.rate(0) == "0"
