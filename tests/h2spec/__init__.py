"""h2spec's server cases (github.com/summerwind/h2spec), ported to raw-socket exchanges: one module
per part of its list, registered in `verify.CASES`; tests/integration/test_h2_conformance.py runs them."""
