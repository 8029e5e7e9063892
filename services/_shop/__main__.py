from roundtrip._shop.app import main

main()
