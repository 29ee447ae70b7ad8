"""Admission: pure quota cores, the combined scope state, async admission, the registry."""
