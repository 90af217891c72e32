# `make test` fails when a source file of core/, server/ or client/ is not
# named in docs/architecture.md (tools/check_doc_files.py), so that the map
# of the code keeps every file and its layer as files come and go.
.PHONY: docs-files
docs-files:
	python3 tools/check_doc_files.py

TEST_TARGETS += docs-files
