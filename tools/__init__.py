"""Offline tools that live in the repository checkout only: nothing here ships in the wheel."""
