"""Read models: what `ov status`, `ov watch`, `ov diff`, `ov costs`, `ov wait` and the dashboard show. Read-only."""
