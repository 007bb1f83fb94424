//go:build tools

// Pins Helm's CLI so that `go mod tidy` keeps its dependencies; build.sh builds ./cmd/helm from it.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
