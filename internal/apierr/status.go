package apierr

import (
	"net/http"

	"github.com/evalbox/evalbox/pkg/client"
)

// Status is the HTTP status of an Error of code: the one table the REST
// API and the compatibility layers answer by. An unknown code is an
// internal error (500).
func Status(code string) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

var statusOf = map[string]int{
	client.CodeBadRequest:        http.StatusBadRequest,
	client.CodeUnauthorized:      http.StatusUnauthorized,
	client.CodeForbidden:         http.StatusForbidden,
	client.CodeNotFound:          http.StatusNotFound,
	client.CodeConflict:          http.StatusConflict,
	client.CodeTooManySandboxes:  http.StatusTooManyRequests,
	client.CodeRateLimited:       http.StatusTooManyRequests,
	client.CodePayloadTooLarge:   http.StatusRequestEntityTooLarge,
	client.CodeSandboxNotRunning: http.StatusConflict,
	client.CodeTimeout:           http.StatusRequestTimeout,
	client.CodeUnavailable:       http.StatusServiceUnavailable,
	client.CodeInternal:          http.StatusInternalServerError,
	client.CodeNoSpace:           http.StatusInsufficientStorage,

	client.CodeOutputBudgetExhausted: http.StatusTooManyRequests,
	// A team's limit, not the host's disk: the request is what is too
	// large for it.
	client.CodeStorageQuotaExceeded: http.StatusRequestEntityTooLarge,
	client.CodeInsufficientCapacity: http.StatusServiceUnavailable,
	client.CodeNotImplemented:       http.StatusNotImplemented,
	client.CodePortClosed:           http.StatusBadGateway,
	client.CodeInsufficientBalance:  http.StatusPaymentRequired,
}
