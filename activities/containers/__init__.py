"""Container model tests: command policy (parse/check/render `docker run`), error taxonomy, and the
offline command writer. The modules here are pure; the docker runner lives beside them."""
