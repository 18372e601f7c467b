package network

// Alias is the alias prefix of l's host links.
func (l *Links) Alias() string { return l.alias }

// BlocksInUse counts the pool's blocks that are taken.
func (m *Manager) BlocksInUse() int {
	m.alloc.mu.Lock()
	defer m.alloc.mu.Unlock()
	n := 0
	for _, u := range m.alloc.used {
		if u {
			n++
		}
	}
	return n
}
