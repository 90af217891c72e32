# mk/layers.mk: `make test` fails when files of server/ or client/ call each
# other in a circle (a file that calls a file that calls it back), so that
# the layering docs/architecture.md draws for them is enforced by the build
# rather than hoped for.  tools/check_layers.py reads it off the objects
# `make all` built (nm), with the symbols that close any circle.

.PHONY: layers-check
layers-check: all
	python3 tools/check_layers.py $(BUILD) server client

TEST_TARGETS += layers-check
