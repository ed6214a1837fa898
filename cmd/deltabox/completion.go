package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// completionFlag is the hidden flag urfave/cli answers with the words that may come next.
const completionFlag = "--generate-bash-completion"

const bashCompletion = `# bash completion for deltabox: source <(deltabox completion bash)
_deltabox_complete() {
	local cur="${COMP_WORDS[COMP_CWORD]}" words
	if [[ "$cur" == -* ]]; then
		words=$("${COMP_WORDS[0]}" "${COMP_WORDS[@]:1:$COMP_CWORD-1}" "$cur" ` + completionFlag + ` 2>/dev/null)
	else
		words=$("${COMP_WORDS[0]}" "${COMP_WORDS[@]:1:$COMP_CWORD-1}" ` + completionFlag + ` 2>/dev/null)
	fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _deltabox_complete deltabox
`

const zshCompletion = `#compdef deltabox
# zsh completion for deltabox: source <(deltabox completion zsh)
_deltabox() {
	local -a words_
	local cur="${words[CURRENT]}"
	if [[ "$cur" == -* ]]; then
		words_=("${(@f)$("${words[1]}" "${(@)words[2,CURRENT-1]}" "$cur" ` + completionFlag + ` 2>/dev/null)}")
	else
		words_=("${(@f)$("${words[1]}" "${(@)words[2,CURRENT-1]}" ` + completionFlag + ` 2>/dev/null)}")
	fi
	words_=("${(@)words_%%:*}")
	compadd -a words_
}
compdef _deltabox deltabox
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name: "completion", Usage: "print a shell completion script (bash, zsh or fish)", ArgsUsage: "SHELL",
		Description: "bash: source <(deltabox completion bash)\n" +
			"zsh:  source <(deltabox completion zsh)\n" +
			"fish: deltabox completion fish | source",
		Action: func(c *cli.Context) error {
			if err := exactArgs(c, 1, "SHELL"); err != nil {
				return err
			}
			switch c.Args().First() {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, zshCompletion)
				return err
			case "fish":
				script, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(c.App.Writer, script)
				return err
			}
			return usagef("completion %q: want bash, zsh or fish", c.Args().First())
		},
	}
}

// completeSandboxIDs completes the first argument of verbs that take a sandbox ID with the
// IDs of the leased sandboxes (quietly nothing when the daemon does not answer).
func completeSandboxIDs(cmds []*cli.Command) {
	for _, c := range cmds {
		if strings.HasPrefix(c.ArgsUsage, "ID") && c.BashComplete == nil {
			c.BashComplete = func(ctx *cli.Context) {
				if ctx.NArg() > 0 {
					return
				}
				sbs, err := newClient(ctx).Sandboxes(ctx.Context)
				if err != nil {
					return
				}
				for _, s := range sbs {
					fmt.Fprintln(ctx.App.Writer, s.ID)
				}
			}
		}
		completeSandboxIDs(c.Subcommands)
	}
}
