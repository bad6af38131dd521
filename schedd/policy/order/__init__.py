"""Order plugins: which pending job is considered next."""
