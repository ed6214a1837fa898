// Package network owns the per-sandbox network of DeltaBox: one bridge with the egress proxy's
// gateway address, one named network namespace per sandbox attached to it through CNI (bridge
// with port isolation, host-local IPAM, loopback), and one host firewall (DeltaBox's own
// iptables chains, hooked into the host's chains by a jump rule per hook) that lets a sandbox
// reach nothing but the proxy ports on the gateway. Plain TCP to port 80/443 anywhere is
// redirected (DNAT) to the proxy's transparent ports as a backstop.
//
// It must not: change the policy of the host's own chains, masquerade or forward sandbox
// traffic, enable IP forwarding, touch interfaces other than its bridge and the sandboxes'
// veths, bind-mount anything into a sandbox, or decide egress policy (that is the proxy's job;
// this package only makes the proxy the sole way out). It knows nothing about containerd: the
// pool puts Attachment.NetNSPath and Attachment.Env into the container's spec.
package network
