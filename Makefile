# Sortie — mission-driven edge agent.
GO       ?= go
PKGS     ?= ./...
TIMEOUT  ?= 8m
ENABLE_RACE ?= true
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.Version=$(VERSION)

ifeq ($(ENABLE_RACE),true)
RACE := -race
endif

.PHONY: all fmt fmt-check vet lint test build bench clean

all: build

fmt:
	gofmt -w .

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

lint: fmt-check vet

# The README's test command: format check, vet, and every test under -race.
test: fmt-check vet
	$(GO) test $(RACE) -count=1 -timeout $(TIMEOUT) $(PKGS)

build:
	mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s $(PKGS)

clean:
	rm -rf bin
