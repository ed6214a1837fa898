package api

import "time"

// EffectAttempt is the outcome of one attempt to deliver an effect (or its compensation).
type EffectAttempt struct {
	Time   time.Time `json:"time"`
	Status int       `json:"status,omitempty"` // the upstream's answer, 0 if none came
	Error  string    `json:"error,omitempty"`  // why it failed, "" if it did not
}

// RetryEffectsRequest names the failed effects to send again; empty: every failed one.
type RetryEffectsRequest struct {
	Effects []string `json:"effects"`
}

// RetryEffectsResult answers a retry: what was sent and how each ended. The request fails
// (failed_precondition, naming them) if any effect failed again.
type RetryEffectsResult struct {
	ID              string   `json:"sandbox"`
	EffectsReleased int      `json:"effects_released"`
	EffectsFailed   int      `json:"effects_failed"`
	Effects         []Effect `json:"effects"`
}
