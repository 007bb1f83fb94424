//go:build tools

// Pins Prometheus's promtool; build.sh builds ./cmd/promtool from it with -tags remove_all_sd.
// go.mod is derived by `go get -tags remove_all_sd` (not `go mod tidy`, which would pull in the
// test dependencies and the service-discovery SDKs of every Prometheus package).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
