# Thin wrappers around scripts/; the scripts are the source of truth.
.PHONY: build run test bench fmt vet

build:
	PATH="$$PATH:/usr/local/go/bin" go build -o bin/boxrt .

run:
	scripts/run

test:
	scripts/test

bench:
	scripts/bench

vet:
	PATH="$$PATH:/usr/local/go/bin" go vet ./...
