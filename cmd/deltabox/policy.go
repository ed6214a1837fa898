//go:build !cli

package main

import (
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/deltabox/deltabox/proxy"
)

// defaultPolicy is what `deltabox policy default` prints: the behaviour of a sandbox without
// a policy, written out, with the other fields as comments (docs/egress-policy.md).
const defaultPolicy = `# DeltaBox egress policy (docs/egress-policy.md). Rules are matched in order, the first
# match decides; a request no rule matches gets the default. This file is what a sandbox
# without a policy gets: reads pass, everything else is held until commit.
version: 1
default: hold                # pass | hold | deny
rules:
  - host: "*"                # exact name, IP literal, *.suffix or *
    methods: [GET, HEAD, OPTIONS]
    action: pass             # pass | hold | compensate | deny
  # More fields and actions:
  # - host: api.openai.com   # an LLM API the agent must reach now
  #   ports: [443]
  #   action: pass
  # - host: github.com       # git push: held, sent on commit, dropped on rollback
  #   path_prefix: /
  #   methods: [POST]
  #   action: hold
  #   response:              # the answer the sandbox gets while the request is held
  #     status: 202          # default 202, with {"held": true, "effect_id": ...}
  #     body: '{"ok": true}'
  #     headers: {Content-Type: application/json}
  # - host: api.payments.example   # sent now; on rollback past it, this request undoes it
  #   methods: [POST]
  #   path_prefix: /v1/charges
  #   action: compensate
  #   compensate:
  #     method: POST
  #     url: 'https://api.payments.example/v1/refunds'
  #     body: '{"charge": "{{.Response.JSON.id}}"}'
  #     headers: {Content-Type: application/json}
`

func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: policyUsage,
		Subcommands: []*cli.Command{{
			Name: "default", Usage: "print the policy a sandbox without one gets, commented",
			Action: func(c *cli.Context) error {
				if err := exactArgs(c, 0, ""); err != nil {
					return err
				}
				_, err := io.WriteString(c.App.Writer, defaultPolicy)
				return err
			},
		}, {
			Name: "check", Usage: "check a policy file as the daemon would (errors name the line and the field)", ArgsUsage: "FILE",
			Action: func(c *cli.Context) error {
				if err := exactArgs(c, 1, "FILE"); err != nil {
					return err
				}
				data, err := os.ReadFile(c.Args().First())
				if err != nil {
					return err
				}
				p, err := proxy.ParsePolicy(data)
				if err != nil {
					return fmt.Errorf("%s: %w", c.Args().First(), err)
				}
				res := map[string]any{"file": c.Args().First(), "rules": len(p.Rules), "default": p.Default}
				return printResult(c, res, func(w io.Writer) {
					fmt.Fprintf(w, "%s: ok, %d rules, default %s\n", c.Args().First(), len(p.Rules), p.Default)
				})
			},
		}},
	}
}
