//go:build tools

// Package tools pins the kwok controller this wrapper module builds.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
