"""specdash runner: real draft/target pairs, one recorded row per verification round."""
