"""Tests of service/documents/: markup today, the document formats later."""
