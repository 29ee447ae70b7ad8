"""Tests of the project as a whole: layout, exports, typing, docs, the dev script."""
