"""Modelling code copied into diff_v2 exports (loaded by transformers with trust_remote_code)."""
