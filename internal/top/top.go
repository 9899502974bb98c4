package top

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/profi-dev/profi/internal/client"
)

// cli is the grammar of `profi top`.
type cli struct {
	client.Flags
	Interval  time.Duration `name:"interval" short:"n" default:"2s" help:"Time between two scrapes (the rate window)."`
	Sort      string        `name:"sort" short:"s" default:"launch_rate" help:"Column to sort by: ${sort_keys}."`
	Asc       bool          `name:"asc" help:"Sort ascending (default: descending)."`
	Namespace string        `name:"namespace" placeholder:"PATTERN" help:"Only pods of these namespaces (shell pattern)."`
	Pod       string        `name:"pod" placeholder:"PATTERN" help:"Only these pods (shell pattern, e.g. 'llm-*')."`
	Once      bool          `name:"once" help:"Scrape twice --interval apart, print one frame and exit (for scripts)."`
	Raw       bool          `name:"raw" help:"Exact numbers (bytes, seconds) instead of units."`
}

// Main runs `profi top` with args (after the subcommand) and returns the
// exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	k, err := kong.New(&c, kong.Name("profi top"),
		kong.Description("A live view of a running agent's /metrics per pod and process. LAUNCH/S and LAUNCHES count kernels that ran: direct launches plus the kernels CUDA graph replays ran; GRAPH% is the share of the window's kernels that ran through graphs (- for none). Keys: ←/→ sort column, r reverse, q quit."),
		kong.Writers(stdout, stderr), kong.Exit(func(int) {}),
		kong.Vars{"sort_keys": strings.Join(ColumnKeys(), ", ")})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	_, err = k.Parse(args)
	if slices.Contains(args, "--help") || slices.Contains(args, "-h") { // kong printed the usage
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "profi top: %v\n", err)
		return 2
	}
	col := ColumnIndex(c.Sort)
	if col < 0 {
		fmt.Fprintf(stderr, "profi top: --sort %q: want one of %s\n", c.Sort, strings.Join(ColumnKeys(), ", "))
		return 2
	}
	if c.Interval <= 0 {
		fmt.Fprintf(stderr, "profi top: --interval must be positive, got %s\n", c.Interval)
		return 2
	}
	cl, err := client.New(c.Flags)
	if err != nil {
		fmt.Fprintf(stderr, "profi top: %v\n", err)
		return 2
	}
	v := &viewer{cl: cl, opts: c, col: col, asc: c.Asc}
	if c.Once {
		prev, err := v.scrape(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "profi top: %v\n", err)
			return 1
		}
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(c.Interval):
		}
		cur, err := v.scrape(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "profi top: %v\n", err)
			return 1
		}
		fmt.Fprint(stdout, v.render(prev, cur))
		return 0
	}
	p := tea.NewProgram(&model{v: v, ctx: ctx}, tea.WithAltScreen(), tea.WithContext(ctx), tea.WithOutput(stdout))
	if _, err := p.Run(); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "profi top: %v\n", err)
		return 1
	}
	return 0
}

// viewer scrapes and renders; shared by --once and the live view.
type viewer struct {
	cl   *client.Client
	opts cli
	col  int
	asc  bool
}

func (v *viewer) scrape(ctx context.Context) (Scrape, error) {
	fams, err := v.cl.Metrics(ctx)
	if err != nil {
		return Scrape{}, err
	}
	return Scrape{Time: time.Now(), Families: fams}, nil
}

func (v *viewer) render(prev, cur Scrape) string {
	f := Compute(prev, cur)
	f.Filter(v.opts.Namespace, v.opts.Pod)
	f.Sort(v.col, v.asc)
	return Render(&f, v.cl.URL(), v.col, v.asc, v.opts.Raw)
}

// model is the bubbletea model of the live view: a scrape every
// --interval, the frame of the last two, keys to change the sort.
type model struct {
	v         *viewer
	ctx       context.Context
	prev, cur *Scrape
	err       error
	width     int
}

type scraped struct {
	s   Scrape
	err error
}

func (m *model) scrapeCmd(wait time.Duration) tea.Cmd {
	return func() tea.Msg {
		if wait > 0 {
			select {
			case <-m.ctx.Done():
				return tea.Quit()
			case <-time.After(wait):
			}
		}
		s, err := m.v.scrape(m.ctx)
		return scraped{s, err}
	}
}

func (m *model) Init() tea.Cmd { return m.scrapeCmd(0) }

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "right", "l", ">":
			m.v.col = (m.v.col + 1) % len(Columns)
		case "left", "h", "<":
			m.v.col = (m.v.col + len(Columns) - 1) % len(Columns)
		case "r":
			m.v.asc = !m.v.asc
		}
	case tea.WindowSizeMsg:
		m.width = msg.Width
	case scraped:
		m.err = msg.err
		if msg.err == nil {
			m.prev, m.cur = m.cur, &msg.s
		}
		return m, m.scrapeCmd(m.v.opts.Interval)
	}
	return m, nil
}

var (
	headerStyle = lipgloss.NewStyle().Bold(true)
	errStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("1"))
)

func (m *model) View() string {
	var b strings.Builder
	switch {
	case m.prev == nil && m.err == nil:
		b.WriteString("profi top: waiting for two scrapes of " + m.v.cl.URL() + " ...\n")
	case m.prev != nil:
		text := m.v.render(*m.prev, *m.cur)
		head, rest, _ := strings.Cut(text, "\n")
		b.WriteString(headerStyle.Render(head) + "\n" + rest)
	}
	if m.err != nil {
		b.WriteString(errStyle.Render("error: "+m.err.Error()) + "\n")
	}
	b.WriteString("←/→ sort column  r reverse  q quit\n")
	return b.String()
}
