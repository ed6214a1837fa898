package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"text/template"
)

// templateMessage is a request or response as seen by a compensate template.
type templateMessage struct {
	Method string
	URL    string
	Status int
	Header http.Header
	Body   string
	JSON   any // the body decoded as JSON, nil if it is not JSON
}

type templateData struct {
	Request  templateMessage
	Response templateMessage
}

// renderCompensation fills a compensate template from the original request and response.
// The result may reach a non-public address only if the policy names its host exactly.
func renderCompensation(c *CompensateTemplate, pol *Policy, req storedRequest, resp *http.Response, respBody []byte) (*storedRequest, error) {
	data := templateData{
		Request: templateMessage{
			Method: req.Method, URL: req.URL, Header: req.Header, Body: string(req.Body), JSON: decodeJSON(req.Body),
		},
		Response: templateMessage{
			Status: resp.StatusCode, Header: resp.Header, Body: string(respBody), JSON: decodeJSON(respBody),
		},
	}
	rawURL, err := execTemplate(c.URL, data)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil {
		return nil, fmt.Errorf("compensate url %q is not an absolute http(s) URL", sanitize(rawURL))
	}
	host, _, err := splitHostPort(u.Host, defaultPort(u.Scheme))
	if err != nil {
		return nil, fmt.Errorf("compensate url: %w", err)
	}
	out := &storedRequest{Method: c.Method, URL: u.String(), Header: http.Header{}, AllowPrivate: pol.namesHost(host)}
	body, err := execTemplate(c.Body, data)
	if err != nil {
		return nil, err
	}
	out.Body = []byte(body)
	for k, t := range c.Headers {
		v, err := execTemplate(t, data)
		if err != nil {
			return nil, err
		}
		if !validHeader(k, v) {
			return nil, fmt.Errorf("compensate header %q renders to an invalid value", k)
		}
		out.Header.Set(k, v)
	}
	return out, nil
}

func execTemplate(t *template.Template, data templateData) (string, error) {
	if t == nil {
		return "", nil
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return "", fmt.Errorf("compensate %s: %w", t.Name(), err)
	}
	return buf.String(), nil
}

func decodeJSON(b []byte) any {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}
