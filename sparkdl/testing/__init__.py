"""Test and benchmark infrastructure shipped with sparkdl (a multi-host cluster on one machine)."""
