# Thin wrappers around scripts/; the scripts are the source of truth.
.PHONY: build run test bench fmt vet

# CGO_ENABLED=0: the binary is static, because it is also the session
# agent that runs inside any sandbox image (boxrt agent).
build:
	PATH="$$PATH:/usr/local/go/bin" CGO_ENABLED=0 go build -o bin/boxrt .

run:
	scripts/run

test:
	scripts/test

bench:
	scripts/bench

vet:
	PATH="$$PATH:/usr/local/go/bin" go vet ./...
