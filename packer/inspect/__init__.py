"""Looking at a finished store: a summary (summary), contact sheets, listings and extracts (look),
how well mixed its order is (shuffle_report), and its records out again (unpack, convert)."""
